"""Readers turn files and the environment into frozen facts; a reader that cannot read says why."""
