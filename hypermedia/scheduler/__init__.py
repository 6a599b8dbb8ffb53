"""Leader election and the maintenance services only the leader runs."""
