"""Reporting: the change record behind ``report()`` (``record``), the compile report
collected from torch's events (``collector``, ``breaks``, ``placement``), its schema
(``schema``) and the job view of ``doctor --report`` (``view``)."""
