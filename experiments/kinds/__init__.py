"""The kinds grid (issue 17): grid.sh runs it, summarize.py turns its bench into the verdicts."""
