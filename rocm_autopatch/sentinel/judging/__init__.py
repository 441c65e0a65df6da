"""The verdict on one call: ``judge`` (compiled and eager against float64: torch's criterion
and the rules for what it misses and what it wrongly flags), ``errors`` (each value's
statistics, read in one batch), ``allowance`` (what a correct math function may round) and
``status`` (the words a graph's verdict is written in) and ``graph_record`` (a watched graph's
record, its verdict and what led to it, declared once). Needs nothing of the sentinel."""
