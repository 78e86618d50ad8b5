"""What users do with exported patches: apply one, verify all, rebase one onto another tag."""
