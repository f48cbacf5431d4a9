"""The client commands of the `fleetprof` CLI (report, rightsizing, replay, import-trace, estimate): REST calls
through fleetprof.client, nothing that needs a GPU node, the server or the dashboard."""
