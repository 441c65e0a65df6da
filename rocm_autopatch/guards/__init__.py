"""Compile guards: ``torch.compile``'s modes and options made safe (``compile_options``), the
one compile-frame hook (``compile_frame``), compiles during graph capture (``capture``) and
the slow-compile warning (``watchdog``)."""
