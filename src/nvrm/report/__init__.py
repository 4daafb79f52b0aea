"""What users look at: the ranking report and preference-pair evaluation."""
