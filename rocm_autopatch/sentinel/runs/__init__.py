"""What a check runs: ``graph`` (a graph under watch: its eager copy, its compiled function,
its record, declared in ``judging.graph_record``), ``numerics`` (the analysis that makes a
second run safe: what it writes, draws or communicates), ``reference`` (the float64
reference), ``snapshot`` (the state a call writes, as it was), ``backward`` (the backward
pass), ``memory`` (what a check may hold), ``replay`` (references captured as a device
graph), ``capturing`` (the sentinel's stream and its captures) and ``deferred`` (a check's
device work beside the program)."""
