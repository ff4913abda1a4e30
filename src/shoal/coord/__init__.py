"""Coordination between replicas: lock, slots (membership), meter."""
