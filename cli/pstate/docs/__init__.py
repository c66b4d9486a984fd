"""Generation of the man pages and shell completions from the commands and the schema."""
