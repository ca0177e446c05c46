"""Programs the integration tests run as processes of their own."""
