"""The Streamlit workbench over the Parquet traces and replays.

The app itself is not built yet; this package reserves its namespace.
"""

__all__: list[str] = []
