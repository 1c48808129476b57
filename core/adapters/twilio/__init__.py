"""Twilio, in one adapter: the only package that imports the twilio SDK.

* ``signatures``: whether a webhook or media socket really comes from Twilio (and the signature
  the loopback peers sign with);
* ``twiml``: the TwiML that answers a call or a message;
* ``rest``: the REST client that sends messages and checks the account;
* ``media_streams``: the Media Streams frames of a call, parsed in and built out.

It sits in ``core`` because both ``voice`` (calls) and ``gateway`` (webhooks, messaging) use it.
"""
