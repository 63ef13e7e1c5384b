"""The ``nbbudget`` command: ``explain``, ``inspect``, and ``run``, ``jobs`` and ``cancel`` with
the runner process that executes a notebook and the records it keeps.

Imports the core and the call layer, never the Jupyter layer (the runner talks to the kernel's
side of ``nbbudget run`` through messages). Internal: users run ``nbbudget``.
"""
