// The measure tools' HTTP client is net's (net/http_client.h), shared with the server's decode
// workers; these names keep the measure code and its tests unchanged.
#pragma once

#include "net/http_client.h"

namespace dsinfer::measure {

using net::HttpCall;
using net::HttpRequestSpec;
using net::HttpResult;
using net::ParseUrl;
using net::Url;

}  // namespace dsinfer::measure
