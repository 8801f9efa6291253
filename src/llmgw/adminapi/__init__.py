"""The admin API: its route table, handlers, views and OpenAPI document, above the control plane."""
