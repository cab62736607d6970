"""The controller process: ``app`` (the thin os-ken adapter), ``routing`` (its decisions,
pure), ``telemetry`` (what is collected, pure), ``collector`` (its I/O), ``__main__`` (the
process entry point, started by ``apply.processes.controller``). os-ken is imported only inside the
controller process: it monkey-patches the interpreter with eventlet."""
