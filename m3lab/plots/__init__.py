"""Plot functions: take DataFrames, return plotly figures (the only place m3lab imports plotly)."""
