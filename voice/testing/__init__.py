"""Test kit for voice: a loopback OpenAI Realtime server and a loopback Twilio caller."""
