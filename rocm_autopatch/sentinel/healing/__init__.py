"""A graph found wrong: ``alarm`` (its warning, its repro, and under ``fallback`` eager from
then on), ``repro`` and ``repro_runner`` (the directory to attach upstream), ``bisect``
with ``steps``, ``step_server``, ``step_child`` and ``naming`` (the compiler step to blame,
each step in an interpreter of its own), ``background`` (the bisection started at exit)
and ``fixes`` (the fix remembered, and applied at the next run). A bisect question starts
here."""
