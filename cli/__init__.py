"""The respool command-line interface."""
