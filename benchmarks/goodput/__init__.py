"""The goodput benchmark: open-loop load from real traces with the papers' SLO mixes, scored
client-side, compared side by side across policies and servers (ours, stock SGLang, a router)."""
