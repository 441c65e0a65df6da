"""What a check runs: ``graph`` (a graph under watch: its eager copy, its compiled function,
its record), ``graph_record`` (that record, declared once), ``numerics`` (the analysis that
makes a second run safe: what it writes, draws or communicates), ``reference`` (the float64
reference), ``snapshot`` (the state a call writes, as it was), ``backward`` (the backward
pass) and ``memory`` (what a check may hold)."""
