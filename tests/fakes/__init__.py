"""Local stand-ins for outside services: real HTTP servers on 127.0.0.1 speaking each API's wire format."""
