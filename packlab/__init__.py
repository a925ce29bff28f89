"""packlab: support code for the course."""
