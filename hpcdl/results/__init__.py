"""What records become: the score of a system, the ranking list, and reports."""
