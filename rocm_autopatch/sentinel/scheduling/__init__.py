"""When the sentinel checks a call: ``schedule`` (the first calls, a new shape, values
beyond those checked, a position past the ladder, samples within the budget, and the
budget's ledger) and ``magnitudes`` (what a graph's inputs hold, read without a
synchronisation). A decode-loop question starts here."""
