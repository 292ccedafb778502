"""Relay's Kubernetes operator (kopf).

`handlers` is the only module that imports kopf: it wires kopf's events to the pure rules
(`dumps`, `pools`, `dsreplicas`, `conditions`, `backoff`, `times`) and to the two clients
(`relay`, the admin API of the ingress; `kube`, the Kubernetes API with retries).
"""
