"""engram_episodic: the client side of Engram, episodic memory for LLM agents.

The episode model (`engram_episodic.events`), its validation (`engram_episodic.validation`), its JSON
shape (`engram_episodic.shapes`), UTC time helpers and the error hierarchy live here, below every
server module, so an agent that installs only this package builds and validates episodes exactly as
the service does.
"""

__version__ = "0.1.0"
