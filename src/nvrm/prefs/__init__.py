"""Preference data: filtering judgments into clean pairs, and a synthetic task."""
