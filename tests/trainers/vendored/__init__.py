"""Trainers' own reward call paths, copied from their repositories at pinned commits (tests only; each file
names its source, commit and license at the top)."""
