"""Dashboard pages: each module calls `register_page` and provides `layout(**path_vars)` and
`register_callbacks(app)` (callbacks are bound to the app the factory builds, not registered globally)."""
