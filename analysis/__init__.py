"""Analysis: pandas over stored result rows into metrics, figures and tables; it never runs a model."""
