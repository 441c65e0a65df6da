"""Reporting: the compile report, collected from torch's events (``collector``,
``breaks``), written at exit (``lifecycle``, ``document``, ``placement``), its schema
(``schema``) and the job view of ``doctor --report`` (``view``). A sink: the concerns hand
it what they record (the change record, ``rocm_autopatch.record``; the compile watchdog's
warnings through the collector; the sentinel's section as a ``view.Part``); it imports
none of them."""
