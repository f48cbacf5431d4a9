"""Composition roots: commands that run parts of several packages in one process.

`fleetprof up` (up.py) runs the collector, the dashboard and a node agent side by side; `fleetprof estimate
--local` (estimate.py) runs the server's estimator under the client command. Only this package imports
server, dashboard and agent together; server/ and dashboard/ never import agent, fleetprof/ none of them.
"""
