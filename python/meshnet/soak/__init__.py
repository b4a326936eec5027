"""The chaos soak (issue 35): mixed load, injected faults and an attacker on a live swarm (main.py)."""
