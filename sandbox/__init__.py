"""Code-execution sandbox service: SandboxFusion-compatible `/run_code`, stateful sessions, bwrap/docker backends.

Start it with `agentrl sandbox serve --host 127.0.0.1 --port 8080` (or `python -m sandbox`); call it with
`sandbox.client.SandboxClient`.
"""
