"""Data files shipped in the wheel: protocol specs (symlinked from the repository root)."""
