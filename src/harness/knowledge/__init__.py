"""Knowledge bases: tenant documents (Markdown, plain text, PDF) cut into chunks, searched for the context."""
