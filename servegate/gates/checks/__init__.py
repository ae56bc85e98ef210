"""The built-in gates, one module per registered gate; importing a module registers its gate
(`servegate.gates.check` imports them all). No gate imports another: what two gates share lives in
`suites/`, `quality/`, `probes/` or `audits/`."""
