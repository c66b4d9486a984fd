"""What each command does, composed from the layers below: one entry per command, which its command module calls."""
