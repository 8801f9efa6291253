"""Several control planes on one store: who leads, and the routes the leader publishes."""
