"""The transaction coordinator: its pure core and its shell."""
