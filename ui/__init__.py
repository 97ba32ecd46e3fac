"""The Streamlit workbench over the Parquet traces and replays.

``loopledger ui`` runs ``app.py`` here; each page is a ``_pages_*.py``
script beside it. The pages' data comes from plain functions of a
``_data.Traces`` in ``_queries`` and ``_compare`` (DuckDB aggregates,
callable without Streamlit); ``_st`` holds what the pages share. Nothing
here is a public Python API: the workbench is used through its command.
"""

__all__: list[str] = []
