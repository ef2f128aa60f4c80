"""`compose ui`: a small local web app over the run store.

Served by the standard library alone (`http.server`'s threading server, and
hand-written HTML, CSS and one small script; no build step, no extra
dependency): the pages are a handful of server-rendered views over the same
core queries the CLI uses, so a framework would add install weight without
removing code.

- `server`: binding, the token and CSRF checks, routing, answering.
- `views`: the pages, every stored value escaped.
"""
