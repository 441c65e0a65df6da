"""When the sentinel checks a call: ``schedule`` (the first calls, a new shape, values
beyond those checked, a position past the ladder, samples within the budget, and the
budget's ledger), ``magnitudes`` (what a graph's inputs hold, read without a
synchronisation) and ``rungs`` (where a later process starts a graph's ladder). A
decode-loop question starts here."""
