// A whole program, at file scope as the page shows it; tests/tcp.cmake runs it under dtrain-run
// (doc_ps_program).
// links: dtrain::asio
// needs: asio
// @block@
