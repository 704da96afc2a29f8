"""What the context assembler is made of: token counting, secret filtering and compression (SPEC C1-C4)."""
