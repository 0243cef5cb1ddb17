"""What a prediction says: the table and JSON, the trace, prediction intervals, the tornado."""
