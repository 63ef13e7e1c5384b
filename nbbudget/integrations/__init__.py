"""Adapters that put the runs of other libraries under an nbbudget run: pydantic-ai's agents
today (`nbbudget.integrations.pydantic_ai`, public as `nbbudget.pydantic_ai`).

Each imports its library at import, and says which extra installs it when it is missing. They use
`nbbudget.run` and `nbbudget.core`; nothing below imports them. Users import `nbbudget.<name>`.
"""
