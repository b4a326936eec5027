"""The Meshnet gateway: an OpenAI-compatible HTTP API over route sessions."""
