"""Orgs, teams, projects, members, quotas and prices: operations and views, with no fleet inside."""
