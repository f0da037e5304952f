"""What every training loop shares."""
