"""The os-ken controller: ``app`` (the thin os-ken adapter), ``__main__`` (the process
entry point, run by ``process.Controller``). os-ken is imported only inside the
controller process: it monkey-patches the interpreter with eventlet."""
