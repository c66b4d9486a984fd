"""Generation of the man pages, shell completions and measured figures from the commands, the schema and the bench results."""
