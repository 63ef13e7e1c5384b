"""The Jupyter layer: the ``%%budget`` and ``%budget`` magics, their settings, the live panel,
how a cell runs under a call budget, and the kernel's side of ``nbbudget run``.

The only layer that imports IPython, ipywidgets and traitlets. Internal: users import
`nbbudget` and ``%load_ext nbbudget``.
"""
