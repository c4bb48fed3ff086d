"""Who a client is and what it may do: users, passwords, nkeys, JWTs and permissions."""
