"""Push delivery of jobs to webhook callbacks."""
