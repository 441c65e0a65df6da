"""The sentinel's verdicts for a graph, as written in the record and the compile report."""

PENDING = "pending"  # compiled, not yet judged
PASSED = "passed"  # matched eager within the criterion on every checked call
FAILED = "failed"  # computes wrong numbers; results stay the compiled ones (check)
FELL_BACK = "fell back"  # computes wrong numbers; runs eagerly from then on (fallback)
SKIPPED = "skipped"  # not compared, with the reason
ALL = (PENDING, PASSED, FAILED, FELL_BACK, SKIPPED)
WRONG = (FAILED, FELL_BACK)

NAME = "numerics_sentinel"  # its entry in report().fixes
REF = "vllm-project/vllm#28268, ROCm/pytorch#3150, pytorch#187401"
